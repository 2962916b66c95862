"""The vocabulary every layer speaks: ids and namespaces, the data models, errors, input limits, text scoring. No I/O.

Everything else imports from here; this package imports nothing of the service but itself."""
