"""A one-layer host KV cache holding given rows: the stored operands the attention kernels take, and the bytes a
device cache must equal."""

from guild.engine.state import KVCache
from guild.kvtypes import KVTypes


def kv_layer(kt: str, vt: str, k, v):
    """A one-layer cache in the stored types (kt, vt) holding k, v [ctx, Hkv, hd]: its kernel operands."""
    c = KVCache(1, k.shape[1], k.shape[2], k.shape[0], KVTypes(kt, vt))
    c.begin(k.shape[0])
    c.write(0, k, v)
    c.commit(k.shape[0])
    return c.kv_layer(0)
