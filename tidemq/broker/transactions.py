"""Transactional messages (placeholder while the module is written)."""

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
