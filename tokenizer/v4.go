package tokenizer

// DeepSeekV4AddedTokens returns the added tokens of the DeepSeek-V4 family
// that the DeepSeek-V3 tokenizer.json lacks, with the ids and spellings of
// dsv4-flash.md §6 (only those whose exact text is known). Load(v3JSON,
// config, DeepSeekV4AddedTokens()...) gives a V4-compatible tokenizer for the
// chat format. The returned slice is new on every call.
func DeepSeekV4AddedTokens() []AddedToken {
	list := []struct {
		id int
		s  string
	}{
		{128821, "<think>"},
		{128822, "</think>"},
		{128825, "｜DSML｜"},
		{128826, "<｜begin▁sys｜>"},
		{128827, "<｜end▁sys｜>"},
		{128828, "<｜latest_reminder｜>"},
		{128829, "<｜action｜>"},
		{128830, "<｜query｜>"},
		{128831, "<｜authority｜>"},
		{128832, "<｜domain｜>"},
		{128833, "<｜task｜>"},
		{128834, "<｜political｜>"},
		{128835, "<｜entity｜>"},
		{128836, "<｜title｜>"},
		{128837, "<｜safety｜>"},
		{128838, "<｜answer｜>"},
		{128839, "<｜search｜>"},
		{128840, "<dsml:"},
		{128841, "</dsml:"},
		{128844, "<｜extracted_url｜>"},
		{128845, "<｜read_url｜>"},
		{128846, "<｜end_of_query｜>"},
	}
	out := make([]AddedToken, len(list))
	for i, e := range list {
		out[i] = AddedToken{ID: e.id, Content: e.s, Special: true}
	}
	return out
}
