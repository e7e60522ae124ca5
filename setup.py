"""Everything about the package is in setup.cfg; this file only adds the optional C parts:
the NATS parser's loop and PUB encoder (jetstream/server/_nats_wire_c.c), the ingest batch's
loop (jetstream/server/_ingest_c.c), the acks' loop (jetstream/protocol/_ack_c.c), the
message id window's table (jetstream/idempotence/_ids_c.c), the record batch encoder's
loop (jetstream/stream/_format_c.c), the GETs answered in bulk (jetstream/server/_gets_c.c)
and the cleaner's record key scan (jetstream/compaction/_scan_c.c). Without a C compiler the
install still succeeds and each runs its Python code (`ACCELERATED` in
jetstream.server.nats_wire, jetstream.server.ingest_batch, jetstream.protocol.ack,
jetstream.idempotence.dedupe, jetstream.stream.format, jetstream.server.bulk_gets and
jetstream.compaction.offset_map)."""

from setuptools import Extension, setup

_PARTS = ("jetstream/server/_nats_wire_c.c", "jetstream/server/_ingest_c.c",
          "jetstream/protocol/_ack_c.c", "jetstream/idempotence/_ids_c.c",
          "jetstream/stream/_format_c.c", "jetstream/server/_gets_c.c",
          "jetstream/compaction/_scan_c.c")

_HEADERS = ["jetstream/_decimal.h", "jetstream/_big_endian.h"]

setup(ext_modules=[Extension(source.removesuffix(".c").replace("/", "."), [source],
                             depends=_HEADERS, extra_compile_args=["-O2"], optional=True)
                   for source in _PARTS])
