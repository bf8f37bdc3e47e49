"""Test helpers that ship with artstore (used by the test-suite and by `artstore demo`)."""
