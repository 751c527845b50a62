"""Staged training: the growth operators and the grown training state (operators), in-run growth
(hook), and growth points planned from scaling laws (plan)."""
