"""The arena: several methods run over the same stages from one shared base model, compared by their
forgetting matrices. Its own floor above the curriculum, because it runs the local backend itself: it builds
the shared base (:mod:`.base`, the local warm start) and evaluates each stage's policy on the local engine,
while the curriculum it drives (:mod:`.runner`) reaches a backend only through the stage launcher."""
