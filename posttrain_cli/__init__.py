"""`posttrain`: list, watch, describe, logs, token and reports of episodes, for people."""
