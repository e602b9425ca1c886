"""Sharded, atomic, reshardable checkpoints and HF export.

Modules: :mod:`.layout` (format, index, meta, verification), :mod:`.checksums` (block crc32s, damage errors),
:mod:`.saving` (:func:`save`, :class:`PendingSave`), :mod:`.publishing` (staging, atomic publish, ``LATEST`` and
retention), :mod:`.loading` (:func:`load`, resharding) and :mod:`.hf_export` (:func:`export_hf`, :func:`to_hf`,
:class:`SafetensorsCheckpoint`).  Every public name is importable from ``axonn.checkpoint``.

Layout of a checkpoint directory (on a filesystem every rank can see)::

    path/meta.json          format, grid it was written on, model config, every
                            parameter's HF name and full shape, optimizer param groups
    path/index.json         which shard of which parameter each rank file holds:
                            {"specs": [ShardSpec dict, ...], "files": {file: {name: spec no.}}}
                            (each distinct spec stored once; the files' entries point at it)
    path/rank00000.pt ...   per writing rank: {name: (local tensor, ShardSpec dict)} for the
                            params (and optimizer state) this rank *writes*
    path/extra.pt           ``extra_state`` (rank 0)
    path/checksums.json     the size and the crc32 of every 64 MiB block of each file above, as written
                            (rank 0 gathers them from the writers; absent in a checkpoint saved before
                            checksums were recorded, or with ``checksums=False``: it loads unverified)
    path/COMPLETE           written last; ``load`` refuses a directory without it

Ownership: a shard is written once.  Of the ranks that hold it, the tensor coordinate that
is 0 on every tensor axis the shard is replicated over owns it (depth for row/col blocks,
depth and row/col for norms), and its data replicas, which hold the same shards, split
the writing (:func:`writers`, balanced by size): each rank writes about 1/G_data of
what its tensor coordinate owns, so the save runs at the bandwidth of every node, not
of data slice 0's alone.  Atomicity: everything is written into ``.<name>.tmp``,
fsynced, then renamed to ``path`` by rank 0 (an existing checkpoint at ``path`` is
replaced only after the new one is complete).
``save(..., background=True)`` copies this rank's shards to host memory (a snapshot) and
returns a :class:`PendingSave` whose files a thread writes while training goes on; its
collective ``finish()`` waits, checks that every rank's writes succeeded and only then
writes ``COMPLETE`` and renames, so a failed or interrupted background save leaves the
previous checkpoint in place, exactly as a blocking one does.

Loading looks up in ``index.json`` which stored pieces it needs and opens only their
files.  On the grid the checkpoint was written on (a resumed or requeued job) that
is, for each shard, the identical piece in its writer's file, copied; nothing is
reassembled.  On another grid each shard (the *current* grid's spec) is cut from the
rows of the full tensor it needs, taken from the stored pieces that overlap it
(:func:`axonn.sharding.overlaps`), so a checkpoint written on one grid loads onto any
other; the files are memory-mapped, so each rank reads about its own share of the
bytes and opens only the files that hold it.
Optimizer state tensors with the parameter's shape follow the parameter's
spec; others (e.g. Adam's ``step``) are stored whole.

Checksums: a writer computes the crc32 of each ``CHECKSUM_BLOCK`` (64 MiB) block of a file as its bytes
pass to the file (in ``CHECKSUM_THREADS`` threads, while the caller's thread writes them: no second read,
and a save takes about as long as without, see ``benchmarks/checkpoint_checksum.py``).  :func:`verify`,
which :func:`load` and :func:`to_hf` run before anything is loaded, reads every file of the checkpoint
whole and compares: a file whose bytes differ from those saved (a flipped bit, a truncated copy) is
refused on every rank with a :class:`DamagedCheckpoint` naming the step, the file and the block whose
crc32 differs.  The loader reads only the pieces a rank needs (memory-mapped), but a rank verifies whole
files: the shard files are shared out, file ``rankN.pt`` to rank ``N mod world``, so each file is read
once for its check, by the rank that (on the grid it was written on) loads from it, and every rank reads
about its share of the checkpoint (total / world), blocks in parallel.  On a resume the verification is
then a read of each rank's share, its blocks hashed in parallel; the load that follows reads the same bytes,
from the page cache where the node's memory holds them (else from the filesystem again: up to twice the
bytes of a load without checksums).  The small files (meta.json, index.json, extra.pt) are checked by
every rank that reads them, from the bytes it read.  Anything outside the files (a flipped bit in host
memory, on the network) is not covered.
"""
from __future__ import annotations

from .checksums import (CHECKSUM_BLOCK, CHECKSUM_THREADS, CHECKSUMS, DAMAGED, CrcWriter, DamagedCheckpoint,
                        MissingFromCheckpoint, hash_pool, read_checksums)
from .hf_export import HF_SHARD_BYTES, SafetensorsCheckpoint, export_hf, to_hf
from .layout import (FORMAT, READABLE, TENSOR_AXES, UnsafeCheckpoint, build_index, load_plain, read_extra,
                     read_index, read_meta, tensor_owned, verify, writers)
from .loading import load, pieces_by_name, pieces_to_read
from .publishing import LATEST, TRASH_PREFIX, discard, latest, retain, step_of, write_latest
from .saving import SNAPSHOT_HOST_FRACTION, PendingSave, save, state_bytes

__all__ = [
    "CHECKSUM_BLOCK", "CHECKSUM_THREADS", "CHECKSUMS", "DAMAGED", "CrcWriter", "DamagedCheckpoint",
    "MissingFromCheckpoint", "hash_pool", "read_checksums",
    "HF_SHARD_BYTES", "SafetensorsCheckpoint", "export_hf", "to_hf",
    "FORMAT", "READABLE", "TENSOR_AXES", "UnsafeCheckpoint", "build_index", "load_plain", "read_extra", "read_index", "read_meta", "tensor_owned",
    "verify", "writers",
    "load", "pieces_by_name", "pieces_to_read",
    "LATEST", "TRASH_PREFIX", "discard", "latest", "retain", "step_of", "write_latest",
    "SNAPSHOT_HOST_FRACTION", "PendingSave", "save", "state_bytes",
]
