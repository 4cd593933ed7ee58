"""A separate process holding a session on a RedisStore, for the fault tests.

``python -m tests.redis_child URL stream``: creates session ``k``, prints its
token, then journals events forever, printing ``sent <seq>`` after each
``send_event`` returned (so the parent knows what was journaled).

``python -m tests.redis_child URL hold LEASE_S``: creates ``k``, journals 3
events, prints the token and ``ready``, waits for a line on stdin, tries one
more ``send_event`` and prints the outcome's class name.
"""

from __future__ import annotations

import sys

from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.redis_store import RedisStore


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> None:
    url, mode = argv[0], argv[1]
    lease_s = float(argv[2]) if len(argv) > 2 else 10.0
    store = RedisStore(url, lease_s=lease_s)
    with ThreadSessionRegistry(
        replay_ttl_s=600,
        replay_max_bytes_per_session=64 << 20,
        sweep_interval_s=0.1,
        timeout=10.0,
        store=store,
    ) as registry:
        created = registry.create("k", send=lambda frame: None, close=lambda reason: None)
        _say(created.resume_token.plaintext)
        if mode == "stream":
            n = 0
            while True:
                n += 1
                accepted = registry.send_event("k", {"n": n})
                _say(f"sent {accepted.sequence if accepted else '?'}")
        for n in range(1, 4):
            registry.send_event("k", {"n": n})
        _say("ready")
        sys.stdin.readline()
        try:
            registry.send_event("k", {"n": "after the stop"})
        except Exception as exc:
            _say(type(exc).__name__)
        else:
            _say("written")


if __name__ == "__main__":
    main(sys.argv[1:])
