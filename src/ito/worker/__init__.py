"""``ito-worker``: the runtime on the booked cluster's head node (DESIGN §7.1)."""
