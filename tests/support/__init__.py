"""What several test files share: free ports, the `rdu` runner, the fake gateway,
running node agents and a control plane over gRPC, tokens, certificates, fuzzing."""
