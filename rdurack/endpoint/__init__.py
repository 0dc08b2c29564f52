"""The OpenAI-compatible HTTP endpoint (`rdu serve`): per-model engines that batch live
requests with the stream scheduler and pace their tokens by the emulated sockets."""
