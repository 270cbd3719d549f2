"""The HTTP edge every face shares: bounded reads of bodies and headers, payments in,
outcomes out, errors in the face's shape; who a caller is."""
