"""A stream of requests served by one model on its sockets: arrivals, the batching
policies, what an iteration costs, the replay in the predictor and its report."""
