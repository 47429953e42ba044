"""The ground floor: one-line errors, file modes, input-file checks and progress lines; it imports nothing of ours."""
