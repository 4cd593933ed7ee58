"""RedisStore: sessions in Redis (>= 7, or Valkey) or a Redis Cluster, shared by many processes.

The Redis store's public module (it needs the ``redis`` extra: ``pip install
'duplex-supervisor[redis]'``); its code lives beside the other stores, in
``supervisor/stores/``. See the README's "More than one process".
"""

from supervisor.stores._redis import DEFAULT_KEY_TTL_S, RedisStore

__all__ = ["DEFAULT_KEY_TTL_S", "RedisStore"]
