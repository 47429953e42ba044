"""The ground floor: errors that become one line on stderr, file modes, input-file checks and progress
lines. It imports nothing of ours, so every other package may import it."""
