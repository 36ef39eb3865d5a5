"""Checkpoints for the twin's robots: expert controllers, demonstrations, behaviour cloning and
closed-loop evaluation (`bench train`). Uses the server's policy classes; runs nothing remote.
"""
