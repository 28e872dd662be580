"""A small tool-using demo agent that makes real traces through the gateway.

Plain Python over HTTP: it imports nothing else from the product, like a customer's harness.
Run it with `python -m reviewapp.harness --help`.
"""
