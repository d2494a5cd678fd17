"""spyre_lab.studies: the published Spyre results reproduced on the model, each claim an on/off ablation."""
