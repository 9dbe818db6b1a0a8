"""The pure core: schedules, HRW, tick identity, records, plans, configuration and errors.

No I/O and no asyncio here: every function gives the same answer for the same input.
"""
