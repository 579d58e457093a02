package spec

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// maxFileSize bounds file(): a spec embeds small scripts and keys, not data.
const maxFileSize = 4 << 20

// FunctionNames lists the functions available in a spec, sorted.
func FunctionNames() []string {
	names := make([]string, 0, 64)
	for n := range (&parser{}).functions() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (p *parser) functions() map[string]function.Function {
	return map[string]function.Function{
		// strings
		"chomp":        stdlib.ChompFunc,
		"format":       stdlib.FormatFunc,
		"formatlist":   stdlib.FormatListFunc,
		"indent":       stdlib.IndentFunc,
		"join":         stdlib.JoinFunc,
		"lower":        stdlib.LowerFunc,
		"upper":        stdlib.UpperFunc,
		"title":        stdlib.TitleFunc,
		"replace":      stdlib.ReplaceFunc,
		"regex":        stdlib.RegexFunc,
		"regexall":     stdlib.RegexAllFunc,
		"regexreplace": stdlib.RegexReplaceFunc,
		"split":        stdlib.SplitFunc,
		"strlen":       stdlib.StrlenFunc,
		"substr":       stdlib.SubstrFunc,
		"trim":         stdlib.TrimFunc,
		"trimprefix":   stdlib.TrimPrefixFunc,
		"trimsuffix":   stdlib.TrimSuffixFunc,
		"trimspace":    stdlib.TrimSpaceFunc,
		// collections
		"coalesce":     stdlib.CoalesceFunc,
		"coalescelist": stdlib.CoalesceListFunc,
		"compact":      stdlib.CompactFunc,
		"concat":       stdlib.ConcatFunc,
		"contains":     stdlib.ContainsFunc,
		"distinct":     stdlib.DistinctFunc,
		"element":      stdlib.ElementFunc,
		"flatten":      stdlib.FlattenFunc,
		"keys":         stdlib.KeysFunc,
		"length":       stdlib.LengthFunc,
		"lookup":       stdlib.LookupFunc,
		"merge":        stdlib.MergeFunc,
		"range":        stdlib.RangeFunc,
		"reverse":      stdlib.ReverseListFunc,
		"slice":        stdlib.SliceFunc,
		"sort":         stdlib.SortFunc,
		"values":       stdlib.ValuesFunc,
		"zipmap":       stdlib.ZipmapFunc,
		// numbers
		"abs":      stdlib.AbsoluteFunc,
		"ceil":     stdlib.CeilFunc,
		"floor":    stdlib.FloorFunc,
		"max":      stdlib.MaxFunc,
		"min":      stdlib.MinFunc,
		"parseint": stdlib.ParseIntFunc,
		"pow":      stdlib.PowFunc,
		// encoding
		"csvdecode":  stdlib.CSVDecodeFunc,
		"jsondecode": stdlib.JSONDecodeFunc,
		"jsonencode": stdlib.JSONEncodeFunc,
		// type conversion
		"tobool":   stdlib.MakeToFunc(cty.Bool),
		"tonumber": stdlib.MakeToFunc(cty.Number),
		"tostring": stdlib.MakeToFunc(cty.String),
		"tolist":   stdlib.MakeToFunc(cty.List(cty.DynamicPseudoType)),
		"tomap":    stdlib.MakeToFunc(cty.Map(cty.DynamicPseudoType)),
		// time
		"formatdate": stdlib.FormatDateFunc,
		"timeadd":    stdlib.TimeAddFunc,
		// errors
		"try": tryfunc.TryFunc,
		"can": tryfunc.CanFunc,
		// the outside world
		"env":        p.envFunc(),
		"file":       p.fileFunc(),
		"fileexists": fileExistsFunc(p.opts),
		"abspath":    absPathFunc(p.opts.BaseDir),
	}
}

// resolve makes a path from the spec relative to its directory.
func resolve(baseDir, path string) string {
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(baseDir, path)
}

func (p *parser) fileFunc() function.Function {
	return function.New(&function.Spec{
		Description: "Reads a UTF-8 text file, relative to the spec's directory.",
		Params:      []function.Parameter{{Name: "path", Type: cty.String}},
		Type:        function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			path := resolve(p.opts.BaseDir, args[0].AsString())
			b, err := p.readFile(path)
			if err != nil {
				return cty.NilVal, function.NewArgError(0, err)
			}
			if !utf8.Valid(b) {
				return cty.NilVal, function.NewArgErrorf(0, "%s is not valid UTF-8 text", path)
			}
			if p.file.ReadFiles == nil {
				p.file.ReadFiles = map[string]string{}
			}
			p.file.ReadFiles[path] = string(b)
			return cty.StringVal(string(b)), nil
		},
	})
}

// readFile reads a file for file(), through Options.ReadFile when set.
func (p *parser) readFile(path string) ([]byte, error) {
	if p.opts.ReadFile != nil {
		b, err := p.opts.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("cannot read %s: %v", path, err)
		}
		return b, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", path, unwrapPathError(err))
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory", path)
	}
	if fi.Size() > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", path, unwrapPathError(err))
	}
	return b, nil
}

func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func fileExistsFunc(opts Options) function.Function {
	return function.New(&function.Spec{
		Description: "Reports whether a file exists, relative to the spec's directory.",
		Params:      []function.Parameter{{Name: "path", Type: cty.String}},
		Type:        function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			path := resolve(opts.BaseDir, args[0].AsString())
			if opts.ReadFile != nil {
				_, err := opts.ReadFile(path)
				return cty.BoolVal(err == nil), nil
			}
			fi, err := os.Stat(path)
			return cty.BoolVal(err == nil && !fi.IsDir()), nil
		},
	})
}

func absPathFunc(baseDir string) function.Function {
	return function.New(&function.Spec{
		Description: "Makes a path absolute, relative to the spec's directory.",
		Params:      []function.Parameter{{Name: "path", Type: cty.String}},
		Type:        function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			abs, err := filepath.Abs(resolve(baseDir, args[0].AsString()))
			if err != nil {
				return cty.NilVal, function.NewArgError(0, err)
			}
			return cty.StringVal(abs), nil
		},
	})
}

// envFunc reads Options.Env. An unset variable is an error unless a default
// is given, so a typo does not silently become an empty string.
func (p *parser) envFunc() function.Function {
	return function.New(&function.Spec{
		Description: "Returns an environment variable, or the default when it is unset or empty.",
		Params:      []function.Parameter{{Name: "name", Type: cty.String}},
		VarParam:    &function.Parameter{Name: "default", Type: cty.String},
		Type:        function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			name := args[0].AsString()
			if len(args) > 2 {
				return cty.NilVal, function.NewArgErrorf(2, "env takes a name and at most one default")
			}
			if v, ok := p.env[name]; ok && v != "" {
				if p.file.EnvUsed == nil {
					p.file.EnvUsed = map[string]string{}
				}
				p.file.EnvUsed[name] = v
				return cty.StringVal(v), nil
			}
			if len(args) == 2 {
				return args[1], nil
			}
			return cty.NilVal, function.NewArgErrorf(0, "environment variable %s is not set; give a default: env(%q, \"\")", name, name)
		},
	})
}
