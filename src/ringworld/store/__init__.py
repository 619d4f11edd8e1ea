"""Rendezvous stores: a small key-value service the ranks of a job meet through."""

from ringworld.store.base import Store, store_barrier
from ringworld.store.memory import MemoryStore
from ringworld.store.prefix import PrefixStore
from ringworld.store.tcp import TCPStore, TCPStoreServer

__all__ = ["MemoryStore", "PrefixStore", "Store", "TCPStore", "TCPStoreServer", "store_barrier"]
