"""Checks EC2 Query requests and XML responses against botocore's ec2
service model (the published API description the aws CLI and moto ship).

stdin: {"requests": [{"action": A, "params": {key: value}}],
        "responses": [{"action": A, "xml": "<...Response>"}]}
Prints one line per problem; exits 1 when there is any.
"""
import json
import sys
import xml.etree.ElementTree as ET

import botocore.session

model = botocore.session.get_session().get_service_model("ec2")
problems = []


def query_name(member_name, shape):
    s = shape.serialization
    if "queryName" in s:
        return s["queryName"]
    if "name" in s:
        return s["name"][0].upper() + s["name"][1:]
    return member_name


def walk_query(shape, tokens, key):
    if not tokens:
        if shape.type_name in ("structure", "list", "map"):
            problems.append("%s: %s is a %s, not a value" % (key, shape.name, shape.type_name))
        return
    if shape.type_name == "structure":
        for name, m in shape.members.items():
            if query_name(name, m) == tokens[0]:
                return walk_query(m, tokens[1:], key)
        problems.append("%s: %r is not a member of %s" % (key, tokens[0], shape.name))
    elif shape.type_name == "list":
        if not tokens[0].isdigit() or tokens[0] == "0":
            problems.append("%s: list %s wants an index from 1, got %r" % (key, shape.name, tokens[0]))
            return
        walk_query(shape.member, tokens[1:], key)
    else:
        problems.append("%s: %s is a scalar, got more path %r" % (key, shape.name, ".".join(tokens)))


def xml_name(member_name, shape):
    return shape.serialization.get("name", member_name)


def strip(tag):
    return tag.split("}", 1)[-1]


def walk_xml(shape, el, where):
    if shape.type_name == "structure":
        for child in el:
            tag = strip(child.tag)
            for name, m in shape.members.items():
                if xml_name(name, m) == tag:
                    walk_xml(m, child, where + "." + tag)
                    break
            else:
                problems.append("%s: <%s> is not a member of %s" % (where, tag, shape.name))
    elif shape.type_name == "list":
        item = shape.member.serialization.get("name", "member")
        for child in el:
            if strip(child.tag) != item:
                problems.append("%s: list item <%s>, want <%s>" % (where, strip(child.tag), item))
                continue
            walk_xml(shape.member, child, where + "[]")
    elif len(el):
        problems.append("%s: %s is a scalar with child elements" % (where, shape.name))


data = json.load(sys.stdin)
for r in data.get("requests", []):
    op = model.operation_model(r["action"])
    for key in r["params"]:
        if key in ("Action", "Version"):
            continue
        walk_query(op.input_shape, key.split("."), r["action"] + " " + key)
for r in data.get("responses", []):
    op = model.operation_model(r["action"])
    root = ET.fromstring(r["xml"])
    if strip(root.tag) != r["action"] + "Response":
        problems.append("%s: root <%s>" % (r["action"], strip(root.tag)))
    out = op.output_shape
    for child in root:
        tag = strip(child.tag)
        if tag == "requestId":
            continue
        if out is None:
            if tag != "return":
                problems.append("%s: <%s> in a response without output" % (r["action"], tag))
            continue
        for name, m in out.members.items():
            if xml_name(name, m) == tag:
                walk_xml(m, child, r["action"] + "." + tag)
                break
        else:
            problems.append("%s: <%s> is not in the output %s" % (r["action"], tag, out.name))
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
