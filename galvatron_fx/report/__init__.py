"""What galvatron_fx shows: numbers and tables (:mod:`.fmt`), progress lines (:mod:`.progress`),
graph dumps and ``galvatron-fx inspect`` (:mod:`.inspect`), the predicted timeline as a Chrome
trace (:mod:`.trace`) and the plan as one HTML page (:mod:`.html`)."""
