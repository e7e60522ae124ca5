"""Everything about the package is in setup.cfg; this file only adds the optional C part of
the NATS parser (jetstream/server/_nats_wire_c.c). Without a C compiler the install still
succeeds and the parser runs its Python loop (jetstream.server.nats_wire.ACCELERATED)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("jetstream.server._nats_wire_c",
                             ["jetstream/server/_nats_wire_c.c"],
                             extra_compile_args=["-O2"], optional=True)])
