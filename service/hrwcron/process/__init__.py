"""What runs as an operating-system process: the composition root of a replica (``app.py``),
the ``dev`` playground with its embedded nats-server, child processes and logging.
"""
