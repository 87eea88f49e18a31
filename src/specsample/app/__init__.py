"""What every command shares: options -> loaded models (assemble), the flags generated
from those options (arguments), and the exactness check with its subcommand."""
