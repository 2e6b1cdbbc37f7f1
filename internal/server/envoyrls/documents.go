package envoyrls

// A Document is one configuration file's contents under a name: a file
// read elsewhere, or a RateLimitConfig resource received over xDS.
type Document struct {
	Name string // in error messages and Files
	Data []byte
}

// LoadDocuments loads several documents into one Config, as LoadFiles
// loads files: a domain may appear in only one of them. No documents make
// an empty Config, which limits nothing.
func LoadDocuments(docs ...Document) (*Config, error) {
	return LoadDocumentsWith(LoadOptions{}, docs...)
}

// LoadDocumentsWith is LoadDocuments with o: with o.MergeDomains, documents
// naming the same domain are merged in order, as LoadDirWith merges files.
func LoadDocumentsWith(o LoadOptions, docs ...Document) (*Config, error) {
	c := &Config{domains: map[string]*domainConfig{}, merge: o.MergeDomains}
	for _, d := range docs {
		if err := c.add(d.Data, d.Name); err != nil {
			return nil, err
		}
	}
	return c, nil
}
