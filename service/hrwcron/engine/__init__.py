"""The engine: one replica, in parts (membership, job table, trigger ledger, timer, tick
decisions, dispatcher), talking to the world only through the ports in ``ports.py``.
"""
