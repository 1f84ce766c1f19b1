"""Weight transfer from the trainer to inference workers (``base.WeightStore``)."""
