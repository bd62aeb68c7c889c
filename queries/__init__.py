"""Statistical operators over proxy scores and oracle true values."""
