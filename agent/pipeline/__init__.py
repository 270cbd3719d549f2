"""The one pipeline (CallRequest -> Outcome) and what it hands the faces: the catalogue,
price terms, the bazaar extension, payload values, stage timings."""
