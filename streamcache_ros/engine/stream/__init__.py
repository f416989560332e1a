"""How a camera stream becomes chunks (chunk_queue.py) and tokens with positions (layout.py): shared
by the session, the adapters and the trainer, so all three cut a stream the same way."""
