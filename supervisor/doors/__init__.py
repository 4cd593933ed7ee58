"""The front doors: the seed's methods once (`_door`), served to trio, asyncio and
threads, with the outboxes and the send watchdog they share.

Internal: the public names are exported by `supervisor`.
"""
