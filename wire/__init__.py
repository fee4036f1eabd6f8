"""The agent wire protocol, shared by the coordinator, the HTTP surface and the agent.

``wire.protocol`` declares the events, updates, views and error codes; ``wire.ranks`` is the
encoding of rank sets. Both are pure.
"""
