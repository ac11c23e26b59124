"""Actions change the world: Triton rollback, Istio weight shift, breaker timeout retune, notify."""
