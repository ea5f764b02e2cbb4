"""Value types shared across the request path's stages. Every module here imports
nothing from `gateway` but its siblings, so any layer may use them (.importlinter)."""
