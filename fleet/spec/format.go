package spec

import (
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
)

// Format returns src in canonical HCL layout (indentation, aligned "="),
// keeping comments. It works token by token, so it also accepts input that
// does not parse; use CheckSyntax first to refuse such input.
func Format(src []byte) []byte {
	return hclwrite.Format(src)
}

// CheckSyntax parses src as HCL without decoding it, for tools such as
// `fleetd fmt` that must not rewrite a file they cannot parse.
func CheckSyntax(filename string, src []byte) (*hcl.File, hcl.Diagnostics) {
	return hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
}
