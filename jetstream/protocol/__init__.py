"""Pure wire codecs of the broker: socket API frames and messages, the publisher envelope,
acks, and the validation of names. Bytes in, values out: no sockets, no asyncio, no NATS."""
