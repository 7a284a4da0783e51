"""The Ray member actor and its parts: the actor (:mod:`.actor`), the context that steps
its core under one lock (:mod:`.context`), and the shell of each of its jobs -- elections
(:mod:`.election`), leading and its helpers (:mod:`.leadership`), appends (:mod:`.appends`),
reads (:mod:`.reads`) and the state machine's thread (:mod:`.machine`).  What they decide
is in :mod:`rayledger.actors.core`."""
