"""Where sessions persist: in memory (`_memory`), in Redis or a Redis Cluster
(`_redis`, `_redis_cluster`), and the committer that batches a registry's writes.

Internal: `supervisor.MemoryStore` and `supervisor.redis_store.RedisStore` are
the public names.
"""
