"""The engine core group: changes installed when an engine core runs a plugin scheduler."""
