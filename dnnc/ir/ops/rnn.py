"""rnn ops (to be filled)."""
