"""What mmengine's Runner calls besides the model: hooks (:mod:`.hooks`) and optimizer wrappers
and constructors (:mod:`.optimizers`). Importing it registers them."""
from . import hooks, optimizers  # noqa: F401  (registration)
