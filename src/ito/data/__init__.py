"""What a data set is, shared by the recipes that write data and the pipeline that prepares and
trains on it: the rows of each data role (:mod:`~ito.data.rows`), the seeded held-out split
(:mod:`~ito.data.heldout`) and n-gram decontamination (:mod:`~ito.data.decontam`). Pure
functions of bytes and strings: no file, process or device."""
