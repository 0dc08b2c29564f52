"""Serving a batch of requests end to end, priced by the timing model (`rdu predict
serve`, and a serve job on the socket actors): the request and its resolution on a
platform (`batch`), what its prefill and decode cost (`costs`, summed by `step_sum`),
speculative decoding's assumptions (`speculative`), the report (`report`) and the
predictions (`predict`)."""
