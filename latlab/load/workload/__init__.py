"""What to send and when: the requests (synthetic or from a dataset), a session's
conversation, and the arrival schedule."""
