"""Credits: the append-only ledger, holds and charges, pricing from the catalog, Stripe."""
