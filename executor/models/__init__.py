"""The models an RL job runs, their tokenizers, and the log-prob and packed passes over them."""
