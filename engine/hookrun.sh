# shellcheck shell=bash
# The lean hook command in bash: `bash …/shadowpoint/hookrun.sh AGENT PYTHON` (install-hooks
# writes it for Codex CLI and Gemini CLI, which have no http hooks). bash starts in a few
# milliseconds where Python needs tens: it forwards the payload (stdin) with `/dev/tcp` to the
# sidecar's http endpoint on 127.0.0.1 (`hook_endpoint.py`), the workspace's port and secret read
# at run time from the user's 0600 file under the state dir (never from a project file), and
# waits for the answer exactly as `hookrun.py` does (before a tool that may modify the workspace
# the sidecar answers once the baseline holds its paths). Anything else goes to the Python
# client `PYTHON -I -S …/hookrun.py AGENT` (same payload): no http secret yet, nothing listening
# (it starts the sidecar), a refused request (403), no answer, a session whose missed events are
# still to be reported, a machine without sha256sum. Never fails the agent: exit 0 and nothing on
# stdout; problems go to hooks.log.
exec 1>/dev/null 2>/dev/null
trap "" PIPE  # a peer that went away is an error to handle (the fallback), not a death
export LC_ALL=C
agent=$1
python=$2
here=.
[[ ${BASH_SOURCE[0]} == */* ]] && here=${BASH_SOURCE[0]%/*}

_state_dir() {
    if [[ $OSTYPE == darwin* ]]; then
        state="$HOME/Library/Application Support/shadowpoint"
    else
        local base=${XDG_STATE_HOME#"${XDG_STATE_HOME%%[![:space:]]*}"}
        base=${base%"${base##*[![:space:]]}"}
        state="${base:-$HOME/.local/state}/shadowpoint"
    fi
}

_log() {  # one line in hooks.log, as hookrun.hook_log writes it (UTC; children keep the user's TZ)
    local stamp TZ=UTC0
    printf -v stamp '%(%Y-%m-%dT%H:%M:%S)T' -1
    { mkdir -p -m 700 "$state" && printf '%s.%s+00:00 pid=%s %s: %s\n' "$stamp" "${EPOCHREALTIME:11:3}" "$$" \
        "$agent" "$1" >>"$state/hooks.log"; } 2>/dev/null
}

_fallback() {  # the Python client with the same payload
    [[ -n $python && -x $python ]] || { _log "${1:+$1; }no Python client to fall back to: the event is lost"; exit 0; }
    [[ -n $1 ]] && _log "$1; handed to hookrun.py"
    # hookrun.py from its cached bytecode: run as a script it would be compiled every time.
    printf '%s' "$payload" | "$python" -I -S -c "import sys
from importlib.machinery import SourceFileLoader
path = sys.argv[1]
code = SourceFileLoader('shadowpoint_hookrun', path).get_code('shadowpoint_hookrun')
names = {'__name__': 'shadowpoint_hookrun', '__file__': path}
exec(code, names)
sys.exit(names['main'](sys.argv[2:]))" "$here/hookrun.py" "$agent" || _log "hookrun.py failed (status $?): the event is lost"
    exit 0
}

_hash13() {  # hookrun.workspace_hash: 13 decimal digits of the first 16 bytes of the sha256
    local hex=${1:0:32} r=0 i
    for ((i = 0; i < 32; i++)); do
        r=$(((r * 16 + 16#${hex:i:1}) % 10000000000000))
    done
    printf -v hash13 '%013d' "$r"
}

_locate() {  # the workspace's hash13 and root as hookrun.py finds them; the session's state checked
    command -v sha256sum >/dev/null || _fallback ""
    # The workspace as hookrun._root_of finds it (the agent's project variable, else the payload's
    # cwd), canonical; the session's state file may name another (hookrun's session root wins).
    root=${!project_var}
    if [[ -z $root || ! -d $root ]]; then
        [[ $payload =~ ${top}cwd\"[[:space:]]*:[[:space:]]*\"(/[^\"\\]*)\" ]] || _fallback ""
        root=${BASH_REMATCH[1]}
    fi
    cd -P -- "$root" || _fallback ""
    # One sha256sum for both names: the session's state file and the workspace's http config.
    sums=$(sha256sum <(printf '%s' "$session") <(printf '%s' "$PWD")) || _fallback ""
    session_file="$state/sessions/$agent-${sums:0:24}.json"
    _hash13 "${sums#*$'\n'}"
    if [[ -f $session_file ]]; then
        IFS= read -r -d '' session_state <"$session_file"
        # Missed events still to be reported: the Python client sends the note.
        [[ $session_state == *'"missed"'* ]] && _fallback ""
        if [[ $session_state == *'"root"'* ]]; then
            [[ $session_state =~ \"root\"[[:space:]]*:[[:space:]]*\"(/[^\"\\]*)\" ]] || _fallback ""
            if [[ ${BASH_REMATCH[1]} != "$root" ]]; then
                cd -P -- "${BASH_REMATCH[1]}" || _fallback ""
                sums=$(printf '%s' "$PWD" | sha256sum) || _fallback ""
                _hash13 "$sums"
            fi
        fi
    fi
    root=$PWD
}

started=${EPOCHREALTIME/./}
_state_dir
case $agent in
    codex) project_var=CODEX_PROJECT_DIR ;;
    gemini) project_var=GEMINI_PROJECT_DIR ;;
    claude) project_var=CLAUDE_PROJECT_DIR ;;
    *) _log "unknown agent '$agent'; expected one of claude, codex, gemini"; exit 0 ;;
esac
# Not `$(</dev/stdin)` (no fork, but Gemini CLI hands the hook a socket, which /dev/stdin cannot
# open: every event was lost) nor `read -d ''` (a byte per system call on a pipe or socket).
payload=$(cat; printf x)
payload=${payload%x}
# Top-level keys only (no object opened before them); anything unusual goes to the Python client.
top='^[^{]*\{[^{}]*"'
[[ $payload =~ ${top}session_id\"[[:space:]]*:[[:space:]]*\"([^\"\\]+)\" ]] || _fallback ""
session=${BASH_REMATCH[1]}
[[ $payload =~ ${top}hook_event_name\"[[:space:]]*:[[:space:]]*\"([A-Za-z]+)\" ]] && event=${BASH_REMATCH[1]}
# The note this client left after an earlier event of the session (`hookrun.fast_session_file`):
# the workspace's hash and root, without hashing names again; hookrun.py removes it when it
# records missed events.
fast=""
if [[ $session =~ ^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$ && -f $state/sessions/$agent-$session.fast ]]; then
    # read's status is 0 only for a whole line: a note being written is not taken
    if IFS=' ' read -r hash13 root <"$state/sessions/$agent-$session.fast" && [[ $hash13 =~ ^[0-9]{13}$ && $root == /* ]]; then
        fast=$state/sessions/$agent-$session.fast
    fi
fi
[[ -n $fast ]] || _locate
config="$state/http/$hash13.json"
[[ -f $config && -O $config ]] || _fallback ""
IFS= read -r -d '' conf <"$config"
[[ $conf =~ \"port\"[[:space:]]*:[[:space:]]*([0-9]+) ]] || _fallback ""
port=${BASH_REMATCH[1]}
[[ $conf =~ \"secret\"[[:space:]]*:[[:space:]]*\"([A-Za-z0-9_-]+)\" ]] || _fallback ""
secret=${BASH_REMATCH[1]}
exec 3<>"/dev/tcp/127.0.0.1/$port" || _fallback ""
printf 'POST /hook/%s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' \
    "$agent" "$port" "$secret" "${#payload}" "$payload" >&3 || _fallback "${event:-?}: the sidecar's http endpoint took no request"
IFS=$' \r' read -r -t 600 _ status _ <&3
exec 3<&-
case $status in
    200) ;;
    403) _fallback "${event:-?}: the sidecar's http endpoint refused the secret (403)" ;;
    "") _fallback "${event:-?}: no answer from the sidecar's http endpoint" ;;
    *) _log "${event:-?}: the sidecar answered $status" ;;
esac
if [[ -z $fast && $status == 200 && $session =~ ^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$ ]]; then
    printf '%s %s\n' "$hash13" "$root" >"$state/sessions/$agent-$session.fast"
fi
if [[ -n $SHADOWPOINT_HOOK_TRACE ]]; then
    elapsed=$((${EPOCHREALTIME/./} - started))
    _log "${event:-?} ok in $((elapsed / 1000)).$(((elapsed % 1000) / 100)) ms (http)"
fi
exit 0
