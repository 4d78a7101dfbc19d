"""Reading stored datasets back at training speed (DALI readers)."""
