"""Recovery at open (validate the log, cut a torn tail, re-dispatch what the indexes miss), the
read-only inspection and checking of a store directory, and repair's quarantine of damaged records."""
