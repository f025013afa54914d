"""Tests with the real agent programs (marker `agents`)."""
