"""Talking to the kubelet: the gRPC client, the decoder, directory watches, socket identity, triggers
and the health machine that turns its answers and failures into lifecycle changes."""
