"""Where a model comes in: ``torch.export`` capture and segmentation (:mod:`.capture`), the
``torch.compile`` backend (:mod:`.backend`) and the Dynamo graph it reads (:mod:`.dynamo_graph`),
and the command line's model sources (:mod:`.model_source`)."""
