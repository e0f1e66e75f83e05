"""What the ops share: block layouts and block sizes, head and dtype helpers, input checks,
left padding. Imports no op."""
