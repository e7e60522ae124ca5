"""Everything about the package is in setup.cfg; this file only adds the optional C parts:
the NATS parser's loop and PUB encoder (jetstream/server/_nats_wire_c.c) and the record
batch encoder's loop (jetstream/stream/_format_c.c). Without a C compiler the install still
succeeds and both run their Python loops (`ACCELERATED` in jetstream.server.nats_wire and
jetstream.stream.format)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("jetstream.server._nats_wire_c",
                             ["jetstream/server/_nats_wire_c.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("jetstream.stream._format_c", ["jetstream/stream/_format_c.c"],
                             extra_compile_args=["-O2"], optional=True)])
